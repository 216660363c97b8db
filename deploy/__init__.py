"""What stoke generates for a deployment to run it: Prometheus alert rules and Grafana dashboards."""
