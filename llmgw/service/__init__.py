"""This machine's roles as services (`llmgw service`): what each runs (`spec`), the seam to whatever keeps
them running (`manager`), systemd's units (`systemd`) and the built-in supervisor (`supervisor`)."""
