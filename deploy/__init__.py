"""What stoke generates and runs to deploy it: Prometheus alert rules and Grafana dashboards (alerts.py), and
stoke on Kubernetes: the StokeWorkload custom resource, its kopf operator, and the rendered installation.

A floor between the CLI (`stoke`) and the agents: it speaks to the controller only through its gRPC API
client (`controller.api.client`), like an agent does.
"""
