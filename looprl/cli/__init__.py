"""The command lines: ``looprl-tune``/``python -m looprl tune``, ``looprl-search``,
``looprl-train`` and ``looprl-bench`` (also ``python -m looprl.search`` and so on)."""
