"""The graph supervisor: ``runner.GraphRunner`` starts, watches, restarts and stops a graph's
processes (what `dynnet up`, `dynnet demo` and `dynnet replay` run graphs with);
``recording_hold`` holds the model nodes for a recorder; ``preflight`` checks and measures in a
child. Layer 8, beside nodes/: it holds rclpy and the graph config, never the engine.
"""
