"""Folding text before a deny-list reads it, so that a disguised URL, address or canary reads as its plain form.

Pure (no I/O); used by a lab's text filter (`hacfed.clients.textfilter`), which folds a sample's text
and its deny-list alike before matching (docs/security.md, "Inbound checks on peer text"). `fold`:

1. Unicode compatibility forms (NFKC): fullwidth `ｈｔｔｐｓ：／／` reads `https://`, `ﬁ` reads `fi`;
2. zero-width and other format characters (category Cf: U+200B, U+00AD, bidi controls) are dropped;
3. look-alike letters of Cyrillic, Greek, Armenian and Latin extensions read as the Latin letter they
   imitate (`CONFUSABLES`; Cyrillic `httрs` reads `https`), and look-alike dashes, dots, slashes,
   colons and at signs as their ASCII form (U+2010 `‐` reads `-`);
4. case (`str.casefold`);
5. the spelled-out forms of `@` and `.`: `(at)`, `[at]`, `{at}`, `<at>`, `[@]`, and the same of `dot`
   and `.`; ` dot ` between two words; ` at ` before a domain: `a(at)evil(dot)example` and
   `a at evil dot example` read `a@evil.example`.

`squeeze` then drops every whitespace character, so a match that a line break or spaces split reads
whole; a filter matches both views (`views`).

    views("Visit ＨＴＴＰＳ：／／evil [dot] example")   # ('visit https://evil.example', 'visithttps://evil.example')
"""

from __future__ import annotations

import re
import unicodedata

# Look-alike letters, by the Latin letter each imitates: Cyrillic, Greek, Armenian, Latin extensions.
# Upper and lower case apart where they imitate different letters (Greek `Η` an H, `η` an n).
_LOOKALIKES = {
    "a": "аɑαа⍺", "b": "ьвβƅ", "c": "сϲⅽ", "d": "ԁɗ", "e": "еєεҽ", "g": "ɡց", "h": "һнհ", "i": "іιıӏɩ",
    "j": "јϳȷ", "k": "кκ", "l": "ⅼǀ", "m": "мⅿ", "n": "ηпո", "o": "оοσօ", "p": "рρ", "q": "ԛզ",
    "r": "гᴦ", "s": "ѕʂ", "t": "тτ", "u": "υսμ", "v": "νѵ", "w": "ԝѡω", "x": "хχ", "y": "уγү", "z": "ᴢ",
    "A": "АΑ", "B": "ВΒ", "C": "СϹ", "E": "ЕΕ", "H": "НΗ", "I": "ІΙӀ", "J": "Ј", "K": "КΚ", "M": "МΜ",
    "N": "Ν", "O": "ОΟՕ", "P": "РΡ", "S": "Ѕ", "T": "ТΤ", "X": "ХΧ", "Y": "ҮΥ", "Z": "Ζ",
    # punctuation that builds URLs and addresses
    "-": "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2043\ufe58\ufe63\uff0d",
    ".": "\u2024\u3002\uff0e\u00b7\u2027\u0701\u0702\ufe52\uff61",
    "/": "\u2044\u2215\u29f8\u2571\uff0f",
    ":": "\u2236\u0589\ua789\ufe55\uff1a\u02d0",
    "@": "\uff20\ufe6b",
}
CONFUSABLES: dict[str, str] = {ch: latin for latin, chars in _LOOKALIKES.items() for ch in chars}
_TABLE = str.maketrans(CONFUSABLES)

_OPEN, _CLOSE = r"[(\[{<]", r"[)\]}>]"
# Each match starts where a run of whitespace starts (`(?<!\s)`), so a long run is read once.
_BRACKETED_AT = re.compile(rf"(?<!\s)\s*{_OPEN}\s*(?:at|@)\s*{_CLOSE}\s*")
_SPELLED_DOT = re.compile(rf"(?<!\s)\s*{_OPEN}\s*(?:dot|\.)\s*{_CLOSE}\s*|(?<=\w)\s+dot\s+(?=\w)")
# A plain ` at ` is an at sign only before a domain (`bob at evil.example`, once ` dot ` is read): in
# honest prose it is a word (`at the store. Then`), and read as `@` there it would make addresses of
# sentences.
_SPELLED_AT = re.compile(r"(?<=\w)\s+at\s+(?=[\w-]+(?:\.[\w-]+)*\.[^\W\d_])")
_WHITESPACE = re.compile(r"\s+")


def fold(text: str) -> str:
    """`text` in its plain form (the module docstring's steps 1-5); line breaks and spaces are kept."""
    text = unicodedata.normalize("NFKC", text)
    if not text.isascii():
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf").translate(_TABLE)
        text = unicodedata.normalize("NFKC", text)  # a look-alike's Latin letter may compose with a mark
    text = text.casefold()
    text = _BRACKETED_AT.sub("@", text)
    text = _SPELLED_DOT.sub(".", text)
    return _SPELLED_AT.sub("@", text)


def squeeze(text: str) -> str:
    """`text` without any whitespace character."""
    return _WHITESPACE.sub("", text)


def views(text: str) -> tuple[str, str]:
    """(fold(text), the same squeezed): what a deny-list is matched against."""
    folded = fold(text)
    return folded, squeeze(folded)


__all__ = ["CONFUSABLES", "fold", "squeeze", "views"]
