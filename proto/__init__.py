"""hacfed wire schema (installed as ``hacfed.proto``)."""
