"""The HTTP API: routes, the shared web toolkit, auth, errors and the OpenAPI document.

It may use the engine and observability; nothing below it imports it back.
"""
