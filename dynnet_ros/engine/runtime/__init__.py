"""Runtime (layer 4): executors that run a planned model, and the protocols every executor meets.

``base`` holds the ``Executor`` / ``BudgetedExecutor`` protocols and the typed ``ExecutorStats``;
``ort_executor`` one plain onnxruntime session; ``executor`` the ``PlannedExecutor`` (one session
per segment over one arena) with its segment sessions (``segments``), binding (``binding``), run
loop (``run_loop``), If and Loop runners (``control_flow``, ``loop``), hooks and onnxruntime's
process-wide state (``ort_env``). Planning (``engine/plan``) sits below: nothing here is imported
by it. This ``__init__`` imports nothing.
"""
