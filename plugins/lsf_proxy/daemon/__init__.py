"""The token daemon (``gridgate lsfproxyd start``): the server, its token policy, peers, rate
limits, holding, diagnostics and guards."""
