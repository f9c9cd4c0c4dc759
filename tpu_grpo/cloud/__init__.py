"""The cloud's side: the Pulumi stack (its CLI, its state and what an update replaces), and a slice's GKE cluster
(the Kubernetes API, JobSet manifests). Reads config and infra/."""
