"""``cpctl``'s commands, one module per group: jobs, nodes, quotas, clusters, costs (with utilization and budgets),
reports. Each module's ``COMMANDS`` lists its click commands in the order ``cpctl --help`` shows them."""
