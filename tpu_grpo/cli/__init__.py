"""The command line under tasks.py: the tasks' flags and errors, where a task's jobs run (targets), and the offline
plan."""
