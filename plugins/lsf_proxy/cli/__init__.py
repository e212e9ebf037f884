"""``gridgate lsfproxyd``: the admin commands, their text output and ``import-lsf``."""
