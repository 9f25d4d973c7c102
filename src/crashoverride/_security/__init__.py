"""What keeps a recovery safe: secrets, redaction, fences, the verdict, the gate, the audit trail.

Modules: ``secrets`` (secrets recognised by their value), ``masking`` (secret-named keys inside
values), ``redact`` (the redactor: everything that leaves the process passes it), ``bounded`` (reprs
whose work is bounded: what is walked, what is called), ``text``
(bounded renderings of exceptions and values), ``brief`` (a brief: trusted text we write,
and the occurrence's values, always fenced), ``verdict`` (what a check's return value means),
``audit`` (``ApprovalRequest`` and ``ToolCallRecord``), ``approvers`` (an approver's name
across processes; several asked as one), ``notes`` (notes on the user's exception,
and the one text for an internal error), ``gate`` (every tool call and every run
of agent code: approval, execution, audit record; ``exec``/``eval``/``compile`` live here only),
``handoffs`` (the SDK's tools, agents and handoffs that are not ours, wrapped to pass the gate).

May import: ``_errors``, ``_placement``.
"""
