"""Stacks of nodes: the stack-file resolver, the launcher and its process supervision, ROS domain
isolation, the run monitor, and the simulated stack that collection and evaluation drive."""
