"""Trust between machines: the cluster CA (`ca`), TLS contexts (`tls`), a machine's credential files
(`credentials`) and the check of a peer's certificate against the replicated trust facts (`peer`).
The facts themselves (authorities, tokens, machines, revocations) are `llmgw.domain.trust`."""
