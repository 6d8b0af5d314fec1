"""Errors the gateway returns, in OpenAI's body format ``{"error": {message, type, param, code}}``."""

from __future__ import annotations


class APIError(Exception):
    """An error with its HTTP status and OpenAI-style body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model", "model_not_found")


def invalid_api_key() -> APIError:
    return APIError(401, "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key")


def body_too_large(limit_bytes: int) -> APIError:
    return APIError(413, f"The request body is larger than {limit_bytes} bytes.", "invalid_request_error", None,
                    "request_too_large")


def no_decoder() -> APIError:
    return APIError(503, "No decoder is available to serve this request.", "service_unavailable", None,
                    "no_decoder_available")


def registry_unavailable(reason: str) -> APIError:
    """Redis (the decoder registry) does not answer: nothing can be routed until it is back."""
    return APIError(503, f"The decoder registry is unavailable ({reason}); retry later.", "service_unavailable",
                    None, "registry_unavailable", {"Retry-After": "1"})


def saturated(retry_after_s: int) -> APIError:
    return APIError(429, "Every decoder is at capacity; retry later.", "rate_limit_exceeded", None,
                    "server_overloaded", {"Retry-After": str(retry_after_s)})
