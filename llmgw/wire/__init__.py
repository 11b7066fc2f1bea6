"""The bytes on the wire: the HTTP/1.1 front end and its parser (`front`, `http1`), the ASGI and
hypercorn glue (`asgi`), the messages of the control plane's streams with agents and gateways
(`protocol`, `protocol_agent`) and the client end of such a stream (`stream_client`).
Nothing here knows a role's logic: each role builds its server and its streams on these.
"""
