"""An example hacfed task: write a word backwards.

hacfed finds this module through the entry point `reverse-word` of the group `hacfed.tasks`
(pyproject.toml) and uses, in its sandboxed worker only:

  reward(problem, response) -> float   1.0 when the response, stripped, ends with the word reversed;
                                       else the share of its letters the response's end has in place
  problems(split) -> list[dict]        the words below ("train" / "eval"), for a [task] without files
  prompt_template                      the user message, "{question}" replaced by the word

`problem` is a dict with "prompt_id", "question", "answer" and "prompt" (strings). The data files in
../../data hold the same problems as JSON lines {"question": word, "answer": reversed word}.
"""

from __future__ import annotations

prompt_template = "Write the word backwards: {question}\nAnswer:"

WORDS = (
    "apple", "river", "stone", "cloud", "green", "light", "bread", "chair", "dance", "eagle",
    "flame", "grape", "house", "index", "juice", "knife", "lemon", "money", "night", "ocean",
    "paper", "queen", "radio", "sugar", "table", "uncle", "voice", "water", "youth", "zebra",
    "amber", "brick", "candle", "desert", "engine", "forest", "garden", "harbor", "island", "jungle",
    "kettle", "ladder", "marble", "needle", "orange", "pepper", "rabbit", "silver",
    "tomato", "velvet", "window", "yellow", "anchor", "bottle", "carpet", "dragon", "button", "planet",
)
EVAL_WORDS = 10  # the last ten words are the held-out split


def reward(problem: dict, response: str) -> float:
    """1.0 if the response (surrounding space stripped) ends with the reversed word; else the share
    of the reversed word's letters that the response's last as many characters have in the same
    place ("elppx" for "elppa": 0.8). Partial credit gives a small model a signal to learn from
    before it writes whole words backwards."""
    answer, text = problem["answer"], response.strip()
    if text.endswith(answer):
        return 1.0
    tail = text[-len(answer):].rjust(len(answer))
    return sum(a == b for a, b in zip(tail, answer)) / len(answer)


def problems(split: str) -> list[dict]:
    words = WORDS[:-EVAL_WORDS] if split == "train" else WORDS[-EVAL_WORDS:]
    return [{"question": word, "answer": word[::-1]} for word in words]
