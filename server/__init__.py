"""hacfed coordinator (installed as ``hacfed.server``). Never imports torch."""
