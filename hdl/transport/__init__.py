"""Transport layer: the requester and responder engines, completion ordering and timers."""
