"""Memory sources (psutil, cgroup, Jetson) and the policy that splits the DNN memory pool (no ROS imports)."""
