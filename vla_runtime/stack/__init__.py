"""Stacks of nodes: the stack-file resolver, the launcher, the process supervisor, ROS domain
isolation, the run monitor, and the simulated stack that collection and evaluation drive."""
