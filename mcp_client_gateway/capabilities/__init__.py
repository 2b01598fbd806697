"""The gateway's capabilities, one small class each over the ports it needs; ``GatewayCore`` is their facade.

``common`` holds what several share (the ports, reading records, publishing commands, node tasks, secret
redaction), ``checks`` the argument checks, ``views`` the conversions to output models.
"""
