"""One Agents SDK run: the agent, its tools and namespace, what it is told, its clients.

Modules: ``run`` (build the agent, run it under the deadline, classify the end), ``toolbox``
(each agent tool defined once), ``sdk_tools`` (the tools as SDK function tools, behind the
gate), ``namespace`` (where ``eval_python``/``exec_python`` execute), ``prompt`` (instructions,
input and the fence for untrusted data), ``clients`` (OpenAI clients per loop), ``state``
(mutable state of one run).

May import: ``_placement``, ``_security``, ``_config``, ``_observe``, ``_diagnose``.
"""
