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
    # The kinds maintained secret-detection rule sets know beyond the ones above.
    "gitlab": "glpat-Zx9Yw8Vu7Ts6Rq5Po4Nm",
    "gitlab_runner": "GR1348941aB3dE5fG7hJ9kL1mN3pQ5",
    "slack_webhook": "https://hooks.slack.com/services/T024BE7LD/B01ABCD2EFG/"
    "q8W7e6R5t4Y3u2I1o0P9a8S7",
    "discord_webhook": "https://discord.com/api/webhooks/112233445566778899/"
    "AbCdEfGhIjKlMnOpQrStUvWxYz_0123456789-abc",
    "azure_account_key": "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
    "K1SZFPTOtr/KBHBeksoGMGw==",
    "azure_sas": "Xk3%2FqP9zL0mN7vB5cD1eF4gH6jK8lM%3D",
    "bare_aws_secret": "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
    "url_password": "pg-Pa55w0rd!x",
    "basic_auth": "YWRtaW46c3VwZXJzZWNyZXQ=",
    "env_password": "Env-Pa55-2024",
    "env_token": "tkn_9f8e7d6c5b4a3",
    "twilio": "SK2f6b1c3d4e5f60718293a4b5c6d7e8f9",
    "sendgrid": "SG.aBcDeFgHiJkLmNoPqRsTuV.wXyZaBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgHiJkLm",
    "npm": "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "mailgun": "key-3ax6xnjp29jd6fds4gc373sgvjxteol0",
    "shopify": "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",
    "iban": "GB82 WEST 1234 5698 7654 32",
    "ssn": "078-05-1120",
    "phone": "+1 415 555 2671",
    "phone_us": "(212) 555-0187",
    "in_doc_id": "AKIAJ7EXAMPLEDOCID12",
    "in_metadata_key": "ghp_9z8Y7x6W5v4U3t2S1r0Q9p8O7n6M5l4K3j2I",
    "in_reference_id": "sk-proj-RefIdSecret0123456789abcdef",
    "in_exception": "sk-live-ExceptionSecret0123456789",
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
    f"CI: clone with {SECRETS['gitlab']}; register runners with {SECRETS['gitlab_runner']}.",
    f"Alerts go to {SECRETS['slack_webhook']} and {SECRETS['discord_webhook']}.",
    "DefaultEndpointsProtocol=https;AccountName=docs;"
    f"AccountKey={SECRETS['azure_account_key']};EndpointSuffix=core.windows.net",
    f"Download https://docs.blob.core.windows.net/kb/a.pdf?sv=2022-11-02&sig={SECRETS['azure_sas']}",
    f"The AWS secret for the backup job is {SECRETS['bare_aws_secret']}.",
    f"DATABASE_URL=postgresql://app:{SECRETS['url_password']}@db.internal:5432/kb",
    f"curl -H 'Authorization: Basic {SECRETS['basic_auth']}' https://intranet.example",
    f"SMTP_PASSWORD={SECRETS['env_password']}\nGITHUB_TOKEN={SECRETS['env_token']}",
    f"Twilio {SECRETS['twilio']}, SendGrid {SECRETS['sendgrid']}, npm {SECRETS['npm']}.",
    f"Mailgun {SECRETS['mailgun']}; Shopify admin {SECRETS['shopify']}.",
    f"Refund to IBAN {SECRETS['iban']}; customer SSN {SECRETS['ssn']}.",
    f"Call {SECRETS['phone']} or the US desk at {SECRETS['phone_us']}.",
]
#: A document id and a metadata key that hold secrets (ids and keys are text too).
SECRET_DOC_ID = f"s3://kb/{SECRETS['in_doc_id']}/faq.md"
SECRET_METADATA_KEY = f"note {SECRETS['in_metadata_key']}"
SECRET_REFERENCE_ID = f"kb/{SECRETS['in_reference_id']}"
EXCEPTION_MESSAGE = f"upstream refused key {SECRETS['in_exception']}"
QUESTION = f"My password={SECRETS['password']} does not work, what now?"
ANSWER = f"Reset it; never share the key {SECRETS['openai']} again."
METADATA = {
    "password": SECRETS["metadata_password"],
    "request": {"headers": {"Authorization": SECRETS["metadata_authorization"]}},
    "deep": {"level": [{"refresh_token": SECRETS["metadata_nested_token"]}]},
    "Cookie": SECRETS["metadata_cookie"],
    "raw_body": json.dumps({"password": SECRETS["json_password"]}),
}
