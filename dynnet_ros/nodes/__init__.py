"""rclpy nodes: thin adapters from messages to arrays, the Engine, and back (see docs/ros.md)."""
