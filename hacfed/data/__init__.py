"""Data files that ship with hacfed (installed as package data, so a clone or a wheel needs nothing beside it).

    from hacfed.data import GSM8K_DIR
    GSM8K_DIR / "train.jsonl", GSM8K_DIR / "test.jsonl"      # MIT, see GSM8K_DIR / "README.md"
"""

from __future__ import annotations

from pathlib import Path

GSM8K_DIR = Path(__file__).resolve().parent / "gsm8k"
