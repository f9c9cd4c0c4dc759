"""MaxText's jobs: their command lines, the pipeline and its records, the VM's detached jobs and a slice's JobSets,
following them, their progress, and recovery from a lost VM."""
