"""Real-looking (but invalid) secrets, in the shapes they take in retrieved documents, answers
and metadata. Every value in ``SECRETS`` must be absent from anything stored or sent to the
judge once the tracer has scrubbed a record."""

from __future__ import annotations

import json

SECRETS = {
    "openai": "sk-proj-Jx8Kq2Lm9Np4Rs7Tv1Wy3Za6Bc5De0FgHi2Jk4Lm6No8Pq",
    "anthropic": "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdEfGhIjKlMn",
    "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
    "aws_secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github": "ghp_1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R",
    "slack": "xoxb-2048193847-1029384756-AbCdEfGhIjKlMnOpQrStUvWx",
    "google": "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
    "huggingface": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    "stripe": "sk_live_51HxYzAbCdEfGhIjKlMnOpQrSt",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer": "8f2b1c9d0e7a6b5c4d3e2f1a0b9c8d7e",
    "password": "Tr0ub4dor&3-horse",
    "pem_body": "MIIEowIBAAKCAQEA7bq9Nq1exampleKeyMaterialXyZ",
    "card": "4111 1111 1111 1111",
    "email": "jane.doe@example-corp.com",
    "json_password": "hunter2-prod",
    "json_secret": "s3cr3t-v4lue-9911",
    "json_token": "tok-7f8e9d0c1b2a",
    "double_json_key": "zq9-AbCdEf123456",
    "metadata_password": "correct-horse-battery",
    "metadata_nested_token": "nested-token-0042",
    "metadata_cookie": "sessionid=abc123def456",
    "metadata_authorization": "Basic dXNlcjpwYXNzd29yZA==",
}

DOCUMENTS = [
    f"To call the API use the key {SECRETS['openai']} or the fallback {SECRETS['anthropic']}.",
    f"[default]\naws_access_key_id = {SECRETS['aws_access_key_id']}\n"
    f"aws_secret_access_key = {SECRETS['aws_secret']}",
    f"CI token: {SECRETS['github']}; Slack bot: {SECRETS['slack']}; Maps: {SECRETS['google']}",
    f"HF_TOKEN={SECRETS['huggingface']} and billing key {SECRETS['stripe']}",
    f"curl -H 'Authorization: Bearer {SECRETS['bearer']}' https://api.example.com "
    f"--cookie jwt={SECRETS['jwt']}",
    f"-----BEGIN RSA PRIVATE KEY-----\n{SECRETS['pem_body']}\n-----END RSA PRIVATE KEY-----",
    f"Charge card {SECRETS['card']} and mail the receipt to {SECRETS['email']}.",
    json.dumps({"user": "svc", "password": SECRETS["json_password"]}),
    json.dumps({"secret": SECRETS["json_secret"], "token": SECRETS["json_token"]}),
    json.dumps(json.dumps({"api_key": SECRETS["double_json_key"]})),
]
QUESTION = f"My password={SECRETS['password']} does not work, what now?"
ANSWER = f"Reset it; never share the key {SECRETS['openai']} again."
METADATA = {
    "password": SECRETS["metadata_password"],
    "request": {"headers": {"Authorization": SECRETS["metadata_authorization"]}},
    "deep": {"level": [{"refresh_token": SECRETS["metadata_nested_token"]}]},
    "Cookie": SECRETS["metadata_cookie"],
    "raw_body": json.dumps({"password": SECRETS["json_password"]}),
}
