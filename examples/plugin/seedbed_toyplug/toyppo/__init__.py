"""The agent ``toyppo``: a package with a ``config`` module (torch-free) and a ``learning`` one."""
