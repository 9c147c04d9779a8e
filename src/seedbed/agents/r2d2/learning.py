"""R2D2 is the Q-learning agent with an LSTM and sequence replay: see seedbed.agents.dqn."""

from seedbed.agents.dqn.learning import QAgent

AGENT_CLASS = QAgent
