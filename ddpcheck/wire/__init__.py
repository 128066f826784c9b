"""What a recording rank and its parent exchange: the rank's command line (:mod:`ddpcheck.wire.argv`) and
the names of the files the rank writes for the parent to read (:mod:`ddpcheck.wire.files`).

Plain data below both sides: the session builds a rank's arguments and reads its files, the rank
(``python -m ddpcheck.record``, the rank side, the launcher) parses and writes them, through one
definition each.
"""
