"""``gridgate gate``: ``gate`` (the command and the shim writer) and ``gating`` (the run-time
path, standard library only). Imports nothing: every gated call imports ``gating`` through this
package."""
