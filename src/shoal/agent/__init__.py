"""The provider agent: measured devices offered to a coordinator, and a worker
run for each lease the market gives them."""

from shoal.agent.agent import Agent, AgentConfig, ChainPin

__all__ = ["Agent", "AgentConfig", "ChainPin"]
