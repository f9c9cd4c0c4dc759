"""The command line: the tasks by what they act on (stack_tasks, host_tasks, job_tasks, result_tasks, which tasks.py
gathers), their flags and checks (flags, checks), where a task's jobs run (targets), and the offline plan."""
