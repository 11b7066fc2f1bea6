"""The agent role: discovers this node, supervises engines, keeps one stream to control."""

from llmgw.agent.service import AgentConfig, serve

__all__ = ["AgentConfig", "serve"]
