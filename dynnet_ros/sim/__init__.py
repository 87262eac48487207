"""The sensor simulator's ROS-free half: the synthetic scene and the frames made from it.

The ``sensor_sim`` node publishes these frames live; ``dynnet sim --record`` writes the same
frames into a bag.
"""
