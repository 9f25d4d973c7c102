"""Diagnose mode's read-only evaluation, and the source of live objects.

Modules: ``snapshot`` (each inspection in a forked, throwaway copy of the process),
``confine`` (cuts the copy off from what it shares), ``syscalls`` (a seccomp filter for it),
``readonly`` and ``static`` (evaluation without running object code, where no fork is
available), ``source`` (the source a live object runs now, also after a live repair).

May import: ``_placement``, ``_security``.
"""
