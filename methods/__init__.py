"""The nineteen methods of nshot, one package each (see `nshot list`)."""
