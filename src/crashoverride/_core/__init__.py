"""The one recovery pipeline and the records it runs on.

Modules: ``entry`` (where a failure enters: begin its record, admit it), ``pipeline`` (the
recovery algorithm, written once), ``record`` (the Protocol of what the pipeline needs from a
record), ``recovery`` (the record of one recovery and its outcome),
``prepare`` (step 4: the agent's namespace, instructions and input), ``block`` (what an entry
point protects), ``seen`` (the mark of an exception already dealt with), ``deferred`` (the
source editor and follow-ups, loaded at first use), ``followup`` (one follow-up through the
same pipeline).

May import: ``_placement``, ``_security``, ``_config``, ``_observe``, ``_effects``, ``_diagnose``,
``_repair``, ``_agent``, ``_admission``, ``_followups``.
"""
