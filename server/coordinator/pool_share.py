"""Which part of a round's pool each lab is sent: its own samples and at most K peers per prompt.

With N labs a full pool holds N x prompts x G samples, and sending all of it to every lab costs the
coordinator O(N^2) bytes per round; from 16 labs x 1,000 samples on it no longer fits one message
(`hacfed.wire.MAX_MESSAGE_BYTES`). A lab cannot use that much either: HACPO's cross term for a
prompt averages over the other agents' groups for that prompt, and the paper runs 2-3 agents.

So each lab gets, for every prompt, every one of its own accepted samples (its HACPO update
needs them as its own group) plus the groups of at most `peers_per_prompt` (K) other sources:

- with at most K peers for a prompt, all of them: with N <= K + 1 labs every lab gets the whole
  pool, exactly as before this module existed;
- otherwise, with `choice = "drawn"` (the default), K consecutive sources of the prompt's sorted
  source list, starting at an offset drawn by sha256(salt, learner, prompt): each peer is equally
  likely to be chosen and the load is spread over the sources; the choice is deterministic (a
  resumed coordinator sends the same selection) and no lab can steer it (the ids and the salt are
  fixed before the samples exist);
- with `choice = "successes"`, the K peers whose groups for the prompt hold the most verified
  reward (the sum of the re-verified rewards of the group's accepted samples), ties broken in the
  drawn order above. A learner that is sent one peer per prompt is then sent, for every prompt,
  at least as many verified successes as from any one fixed peer, so a federation of N > K + 1
  labs gives each learner no less to learn from than a pair would, with the same amount of text
  (docs/three-labs.md measured it). A lab can be chosen more often only by earning more verified
  reward; a group is exactly G samples (validation), so padding it or dropping failures does not
  help. With the coordinator's `dedup_successes` a group is ranked by its credited reward instead
  (`credit`, `success_credit`): G copies of one text count once, and a text first accepted from
  another lab counts 0, so copying does not earn reach either; with its `format_gate` a group with a
  sample outside the task's response format (which a lab's inbound filter leaves out) ranks last
  (`success_credit.REFUSED_GROUP`), so text no filtered learner can use does not earn reach.

Capabilities P̂ still cover every agent (they travel in the update, not in the pool). The order of
the samples is the pool's order, so a selection is a sub-sequence of the pool. A share that would not
fit in one message is cut to fewer peers per prompt (`fitted_peers`, the round engine's rule).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence

from hacfed.messages import PEER_CHOICES, RoundUpdate
from hacfed.trajectory import Trajectory
from hacfed.wire.pool_splice import encode_pool_items, header_of, round_update_parts


def share_salt(run_id: str, seed: int, round_id: int) -> str:
    """The salt of the selections sent with round `round_id`'s update (its plan's round; the final
    update's is `rounds`): the same in the Flower driver and the in-process transport, so `hacfed
    sim` sends each lab what a real federation of that many labs would."""
    return f"{run_id}/{seed}/{round_id}"


def shares_of(
    update: RoundUpdate, peers_per_prompt: int, salt: str, choice: str = "drawn",
    credit: Mapping[tuple[str, str], float] | None = None,
) -> Callable[[str], RoundUpdate]:
    """lab -> its update: `update` itself while every lab's selection is the whole pool (at most
    K + 1 sources), else `update` with the lab's selection as its pool (for the in-process
    transport; the Flower driver splices the same selection from encoded records,
    `hacfed.server.round_updates`). credit: as `PoolShares`'s."""
    if len({t.source_id for t in update.pool}) <= peers_per_prompt + 1:
        return lambda learner: update
    shares = PoolShares(update.pool, peers_per_prompt, salt, choice, credit)
    return lambda learner: dataclasses.replace(update, pool=tuple(update.pool[i] for i in shares.indices_for(learner)))


class PoolShares:
    """The selections of one pool; `indices_for(lab)` is cheap after the one pass here."""

    def __init__(
        self, pool: Sequence[Trajectory], peers_per_prompt: int, salt: str, choice: str = "drawn",
        credit: Mapping[tuple[str, str], float] | None = None,
    ) -> None:
        """credit: (prompt id, source) -> what the `successes` choice ranks that group by, where the
        coordinator credits rewards (`dedup_successes`, `format_gate`: `SubmissionIntake.group_credit`; a group not
        in it has 0); None: the sum of the verified rewards of its samples in `pool`."""
        if isinstance(peers_per_prompt, bool) or not isinstance(peers_per_prompt, int) or peers_per_prompt < 0:
            raise ValueError(f"peers_per_prompt must be an int >= 0, got {peers_per_prompt!r}")
        if choice not in PEER_CHOICES:
            raise ValueError(f"peer choice must be one of {', '.join(PEER_CHOICES)}, got {choice!r}")
        self.choice = choice
        self.size = len(pool)
        self.peers_per_prompt = peers_per_prompt
        self._salt = salt.encode("utf-8")
        self._groups: dict[tuple[str, str], list[int]] = {}  # (prompt id, source) -> pool indices
        for i, t in enumerate(pool):
            self._groups.setdefault((t.prompt_id, t.source_id), []).append(i)
        sources: dict[str, list[str]] = {}
        for prompt_id, source in self._groups:
            sources.setdefault(prompt_id, []).append(source)
        self._sources = {p: sorted(s) for p, s in sources.items()}
        self._position = {p: {source: i for i, source in enumerate(s)} for p, s in self._sources.items()}
        # successes: per prompt, the positions of its sources grouped by equal reward, best first
        self._levels: dict[str, list[list[int]]] = {}
        if choice == "successes":
            for prompt_id, ordered in self._sources.items():
                by_reward: dict[float, list[int]] = {}
                for i, source in enumerate(ordered):  # a group's verified reward: the sum over its samples
                    if credit is not None:
                        reward = float(credit.get((prompt_id, source), 0.0))
                    else:
                        reward = math.fsum(pool[j].reward for j in self._groups[prompt_id, source])
                    by_reward.setdefault(reward, []).append(i)
                self._levels[prompt_id] = [by_reward[r] for r in sorted(by_reward, reverse=True)]

    def indices_for(self, learner: str, peers_per_prompt: int | None = None) -> tuple[int, ...]:
        """Pool indices (increasing) of what `learner` is sent; `peers_per_prompt` overrides K."""
        chosen = [i for group in self.groups_for(learner, peers_per_prompt) for i in self._groups[group]]
        chosen.sort()
        return tuple(chosen)

    def groups_for(self, learner: str, peers_per_prompt: int | None = None) -> list[tuple[str, str]]:
        """The (prompt id, source) groups of what `learner` is sent (`indices_for` lists their
        samples), in no particular order; `peers_per_prompt` overrides K. A prompt's peers are its
        sorted sources without the learner; a peer is named by its index j in that list (the
        source at j, or at j + 1 from the learner's own position on), so no list is built per lab."""
        k = self.peers_per_prompt if peers_per_prompt is None else peers_per_prompt
        chosen: list[tuple[str, str]] = []
        for prompt_id, sources in self._sources.items():
            own = self._position[prompt_id].get(learner)
            n = len(sources) - (own is not None)
            if own is not None:
                chosen.append((prompt_id, learner))
            if n <= k:
                chosen.extend((prompt_id, source) for source in sources if source != learner)
                continue
            start = self._offset(learner, prompt_id, n)
            if self.choice == "successes":
                picks = self._most_rewarded(prompt_id, own, start, n, k)
            else:
                picks = [(start + j) % n for j in range(k)]
            skip = n if own is None else own  # peer j is the source at j + (j >= own)
            chosen.extend((prompt_id, sources[j + (j >= skip)]) for j in picks)
        return chosen

    def _most_rewarded(self, prompt_id: str, own: int | None, start: int, n: int, k: int) -> list[int]:
        """The k peers (as peer indices) with the most verified reward; within equal rewards, in the
        drawn order (from `start` on, wrapping): the same as a stable sort of the drawn order."""
        picks: list[int] = []
        for level in self._levels[prompt_id]:
            peers = [i - (own is not None and i > own) for i in level if i != own]
            peers.sort(key=lambda j: (j - start) % n)
            picks.extend(peers[: k - len(picks)])
            if len(picks) == k:
                break
        return picks

    def group_indices(self) -> dict[tuple[str, str], list[int]]:
        """Every (prompt id, source) group's pool indices, increasing (a copy)."""
        return {group: list(indices) for group, indices in self._groups.items()}

    def _offset(self, learner: str, prompt_id: str, n: int) -> int:
        digest = hashlib.sha256(b"\x00".join((self._salt, learner.encode("utf-8"), prompt_id.encode("utf-8")))).digest()
        return int.from_bytes(digest[:8], "big") % n


def fitted_peers(
    update: RoundUpdate, learner: str, peers_per_prompt: int, salt: str, choice: str, max_bytes: int,
) -> tuple[int, int, int]:
    """(k, left out, size): the most peers per prompt k <= `peers_per_prompt` whose share of `update` for
    `learner` (`shares_of`) encodes in at most `max_bytes`, or 0 (its own samples only) when none does;
    how many samples of its share at `peers_per_prompt` the share at k leaves out; the bytes of its
    encoding (over `max_bytes` at k = 0 when even its own samples and the plan do not fit). The
    synchronous driver's rule (`hacfed.server.round_updates.RoundUpdates`): every pool record is
    encoded once, and a share's size is summed from them."""
    items = encode_pool_items(update.pool)
    header = header_of(update)
    shares = PoolShares(update.pool, peers_per_prompt, salt, choice)
    sources = len({t.source_id for t in update.pool})
    k, full = peers_per_prompt, None
    while True:
        chosen = range(len(items)) if sources <= k + 1 else shares.indices_for(learner, k)  # as `shares_of`
        full = len(chosen) if full is None else full
        size = sum(map(len, round_update_parts(header, [items[i] for i in chosen])))
        if size <= max_bytes or k == 0:
            return k, full - len(chosen), size
        k -= 1


__all__ = ["PoolShares", "fitted_peers", "share_salt", "shares_of"]
