"""The token daemon (``gridgate lsfproxyd serve``): the server, its connections and tokens, its
admin commands, the token policy, peers, rate limits, holding, diagnostics, the persisted
blocklist, metrics and guards."""
