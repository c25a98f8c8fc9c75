"""hacfed participant side (installed as ``hacfed.clients``)."""
