"""The learner's side of acting: central inference (``server``: batch the actors' requests, keep
per-env state, call the agent), the unrolls it builds (``unrolls``), and the newest policy handed
to whoever acts (``publish``). ``acting`` is the per-env table every caller of ``agent.act``
keeps, local actors (``seedbed.actor.local``) and evaluation included."""
