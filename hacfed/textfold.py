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

# Look-alike letters and punctuation, by the ASCII character each imitates, named as Unicode names
# them (the letters themselves would read as Latin here): Cyrillic, Greek, Armenian, Latin extensions.
# Upper and lower case apart where they imitate different letters (Greek capital eta an H, small eta
# an n). Fullwidth and small forms are not here: NFKC reads them.
_LOOKALIKES = {
    "a": ("CYRILLIC SMALL LETTER A", "GREEK SMALL LETTER ALPHA", "LATIN SMALL LETTER ALPHA"),
    "b": ("CYRILLIC SMALL LETTER SOFT SIGN", "CYRILLIC SMALL LETTER VE", "GREEK SMALL LETTER BETA"),
    "c": ("CYRILLIC SMALL LETTER ES", "GREEK SMALL LETTER FINAL SIGMA"),
    "d": ("CYRILLIC SMALL LETTER KOMI DE", "LATIN SMALL LETTER D WITH HOOK"),
    "e": ("CYRILLIC SMALL LETTER IE", "CYRILLIC SMALL LETTER UKRAINIAN IE", "GREEK SMALL LETTER EPSILON"),
    "g": ("LATIN SMALL LETTER SCRIPT G", "ARMENIAN SMALL LETTER CO"),
    "h": ("CYRILLIC SMALL LETTER SHHA", "CYRILLIC SMALL LETTER EN", "ARMENIAN SMALL LETTER HO"),
    "i": ("CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I", "CYRILLIC SMALL LETTER PALOCHKA",
          "GREEK SMALL LETTER IOTA", "LATIN SMALL LETTER DOTLESS I", "LATIN SMALL LETTER IOTA"),
    "j": ("CYRILLIC SMALL LETTER JE", "GREEK LETTER YOT", "LATIN SMALL LETTER DOTLESS J"),
    "k": ("CYRILLIC SMALL LETTER KA", "GREEK SMALL LETTER KAPPA"),
    "l": ("LATIN LETTER DENTAL CLICK",),
    "m": ("CYRILLIC SMALL LETTER EM",),
    "n": ("GREEK SMALL LETTER ETA", "CYRILLIC SMALL LETTER PE", "ARMENIAN SMALL LETTER VO"),
    "o": ("CYRILLIC SMALL LETTER O", "GREEK SMALL LETTER OMICRON", "GREEK SMALL LETTER SIGMA",
          "ARMENIAN SMALL LETTER OH"),
    "p": ("CYRILLIC SMALL LETTER ER", "GREEK SMALL LETTER RHO"),
    "q": ("CYRILLIC SMALL LETTER QA", "ARMENIAN SMALL LETTER ZA"),
    "r": ("CYRILLIC SMALL LETTER GHE",),
    "s": ("CYRILLIC SMALL LETTER DZE", "LATIN SMALL LETTER S WITH HOOK"),
    "t": ("CYRILLIC SMALL LETTER TE", "GREEK SMALL LETTER TAU"),
    "u": ("GREEK SMALL LETTER UPSILON", "GREEK SMALL LETTER MU", "ARMENIAN SMALL LETTER SEH"),
    "v": ("GREEK SMALL LETTER NU", "CYRILLIC SMALL LETTER IZHITSA"),
    "w": ("CYRILLIC SMALL LETTER WE", "CYRILLIC SMALL LETTER OMEGA", "GREEK SMALL LETTER OMEGA"),
    "x": ("CYRILLIC SMALL LETTER HA", "GREEK SMALL LETTER CHI"),
    "y": ("CYRILLIC SMALL LETTER U", "CYRILLIC SMALL LETTER STRAIGHT U", "GREEK SMALL LETTER GAMMA"),
    "z": ("LATIN LETTER SMALL CAPITAL Z",),
    "A": ("CYRILLIC CAPITAL LETTER A", "GREEK CAPITAL LETTER ALPHA"),
    "B": ("CYRILLIC CAPITAL LETTER VE", "GREEK CAPITAL LETTER BETA"),
    "C": ("CYRILLIC CAPITAL LETTER ES", "GREEK CAPITAL LUNATE SIGMA SYMBOL"),
    "E": ("CYRILLIC CAPITAL LETTER IE", "GREEK CAPITAL LETTER EPSILON"),
    "H": ("CYRILLIC CAPITAL LETTER EN", "GREEK CAPITAL LETTER ETA"),
    "I": ("CYRILLIC CAPITAL LETTER BYELORUSSIAN-UKRAINIAN I", "CYRILLIC LETTER PALOCHKA", "GREEK CAPITAL LETTER IOTA"),
    "J": ("CYRILLIC CAPITAL LETTER JE",),
    "K": ("CYRILLIC CAPITAL LETTER KA", "GREEK CAPITAL LETTER KAPPA"),
    "M": ("CYRILLIC CAPITAL LETTER EM", "GREEK CAPITAL LETTER MU"),
    "N": ("GREEK CAPITAL LETTER NU",),
    "O": ("CYRILLIC CAPITAL LETTER O", "GREEK CAPITAL LETTER OMICRON", "ARMENIAN CAPITAL LETTER OH"),
    "P": ("CYRILLIC CAPITAL LETTER ER", "GREEK CAPITAL LETTER RHO"),
    "S": ("CYRILLIC CAPITAL LETTER DZE",),
    "T": ("CYRILLIC CAPITAL LETTER TE", "GREEK CAPITAL LETTER TAU"),
    "X": ("CYRILLIC CAPITAL LETTER HA", "GREEK CAPITAL LETTER CHI"),
    "Y": ("CYRILLIC CAPITAL LETTER STRAIGHT U", "GREEK CAPITAL LETTER UPSILON"),
    "Z": ("GREEK CAPITAL LETTER ZETA",),
    # punctuation that builds URLs and addresses
    "-": ("HYPHEN", "FIGURE DASH", "EN DASH", "EM DASH", "HORIZONTAL BAR", "MINUS SIGN", "HYPHEN BULLET"),
    ".": ("IDEOGRAPHIC FULL STOP", "MIDDLE DOT", "HYPHENATION POINT", "SYRIAC SUPRALINEAR FULL STOP",
          "SYRIAC SUBLINEAR FULL STOP"),
    "/": ("FRACTION SLASH", "DIVISION SLASH", "BIG SOLIDUS",
          "BOX DRAWINGS LIGHT DIAGONAL UPPER RIGHT TO LOWER LEFT"),
    ":": ("RATIO", "ARMENIAN FULL STOP", "MODIFIER LETTER COLON", "MODIFIER LETTER TRIANGULAR COLON"),
}
CONFUSABLES: dict[str, str] = {unicodedata.lookup(name): plain for plain, names in _LOOKALIKES.items()
                               for name in names}
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
        # a look-alike's Latin letter may compose with a mark; a capital without a look-alike of its
        # own may have one in lower case
        text = unicodedata.normalize("NFKC", text).casefold().translate(_TABLE)
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
