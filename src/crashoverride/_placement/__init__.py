"""Where code runs: the placements of a recovery and the primitives every layer relies on.

Modules: ``bridge`` (placements, and how agent code reaches the thread that owns the frame),
``agent_loop`` (the process's agent loop, where the running-loop placement's SDK sessions run),
``waiting`` (waiting for other threads' work on any backend), ``lane`` (one failure's heavy
start at a time on an application's loop),
``owner_thread`` (how synchronous entry points drive the async pipeline), ``watchdog`` (stops
agent code still running at the deadline), ``frames`` (write-through frame locals),
``deadline`` (the one deadline of a recovery), ``inside`` (which recovery's agent code runs in
this context), ``offloop`` (imports from async code without stalling the loop).

May import: nothing of the package (the bottom layer; the standard library and anyio only).
"""
