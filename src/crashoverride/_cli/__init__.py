"""The ``crashoverride`` command, and what each of its subcommands shows.

Modules: ``main`` (argument parsing, dispatch), ``demo`` (three recoveries to watch, offline),
``redelivery`` (the demo's Celery scene: a worker killed after a charge; it also drives
examples/celery_redelivery.py), ``redelivery_worker`` (the shop its workers run),
``doctor`` (could a recovery run right now, and if not, why not), ``show`` (recoveries read
back from a ledger), ``show_html`` (them as one self-contained page).

May import: anything below it (it is the top: ``crashoverride``, ``integrations``,
``testing``, ``_eval`` included).
"""
