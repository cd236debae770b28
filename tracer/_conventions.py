"""The span attribute names the tracer writes and reads, in one place for every convention:
OpenInference (Arize Phoenix), the OpenTelemetry GenAI semantic conventions and, read only,
OpenLLMetry's ``traceloop.*`` names. The decorators write the first two; span capture and
``recalltrace collect`` read all three.
"""

from __future__ import annotations

# -- OpenInference ------------------------------------------------------------------------------

SPAN_KIND = "openinference.span.kind"
INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
JSON_MIME_TYPE = "application/json"
LLM_MODEL_NAME = "llm.model_name"
LLM_PROMPT_TOKENS = "llm.token_count.prompt"
LLM_COMPLETION_TOKENS = "llm.token_count.completion"
LLM_TOTAL_TOKENS = "llm.token_count.total"
# Flattened lists: ``{prefix}.{index}.{suffix}``.
RETRIEVAL_DOCUMENTS = "retrieval.documents"
RERANKER_INPUT_DOCUMENTS = "reranker.input_documents"
RERANKER_OUTPUT_DOCUMENTS = "reranker.output_documents"
LLM_INPUT_MESSAGES = "llm.input_messages"
LLM_OUTPUT_MESSAGES = "llm.output_messages"
MESSAGE_ROLE = "message.role"
MESSAGE_CONTENT = "message.content"
FIRST_INPUT_MESSAGE_ROLE = f"{LLM_INPUT_MESSAGES}.0.{MESSAGE_ROLE}"
FIRST_OUTPUT_MESSAGE_ROLE = f"{LLM_OUTPUT_MESSAGES}.0.{MESSAGE_ROLE}"
FIRST_OUTPUT_MESSAGE_CONTENT = f"{LLM_OUTPUT_MESSAGES}.0.{MESSAGE_CONTENT}"
USER_ID = "user.id"
SESSION_ID = "session.id"
TAG_TAGS = "tag.tags"

# -- OpenTelemetry GenAI semantic conventions ---------------------------------------------------

GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_QUERY_TEXT = "gen_ai.retrieval.query.text"
GEN_AI_DOCUMENTS = "gen_ai.retrieval.documents"
GEN_AI_DATA_SOURCE = "gen_ai.data_source.id"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_WORKFLOW_NAME = "gen_ai.workflow.name"
# Names of earlier versions of the conventions, still sent by some instrumentors.
GEN_AI_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
GEN_AI_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
GEN_AI_TOTAL_TOKENS = "gen_ai.usage.total_tokens"
GEN_AI_COMPLETION = "gen_ai.completion"

# -- OpenLLMetry (read only) --------------------------------------------------------------------

TRACELOOP_KIND = "traceloop.span.kind"
TRACELOOP_INPUT = "traceloop.entity.input"
TRACELOOP_OUTPUT = "traceloop.entity.output"
TRACELOOP_WORKFLOW_NAME = "traceloop.workflow.name"
LLM_REQUEST_TYPE = "llm.request.type"
LLM_USAGE_TOTAL_TOKENS = "llm.usage.total_tokens"

# -- vector databases (OpenLLMetry's and the OpenTelemetry database conventions, read only) -----

DB_VECTOR_QUERY_TEXT = "db.vector.query.text"
DB_QUERY_RESULT = "db.query.result"
DB_RESULT_DOCUMENT = "db.query.result.document"
DB_RESULT_ID = "db.query.result.id"
DB_RESULT_SCORE = "db.query.result.score"
DB_RESULT_METADATA = "db.query.result.metadata"
DB_RESULT_DISTANCE = "db.query.result.distance"

# -- resources and events (OpenTelemetry semantic conventions) ---------------------------------

SERVICE_NAME = "service.name"
SERVICE_VERSION = "service.version"
DEPLOYMENT_ENVIRONMENT = "deployment.environment.name"
DEPLOYMENT_ENVIRONMENT_OLD = "deployment.environment"
"""The name before ``deployment.environment.name``, still read."""
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"
EXCEPTION_ESCAPED = "exception.escaped"

# -- the tracer's own ---------------------------------------------------------------------------

RECALLTRACE_SCOPE = "recalltrace"
"""The instrumentation scope of the decorators' spans."""
DOCUMENTS_TOTAL = "recalltrace.retrieval.documents"
DOCUMENTS_ON_SPAN = "recalltrace.retrieval.documents_on_span"
