"""HTTP routes for usage reports, pruning and provider errors."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response

from app.budget.schemas import (
    FORMAT_FIELD_DESCRIPTION,
    USAGE_EXAMPLES,
    ProviderError,
    ProviderErrorVerdict,
    PruneRequest,
    PruneResult,
    UsageReport,
    UsageResponse,
)
from app.budget.service import BudgetService
from app.core.database import EngineDep
from app.core.openapi import problems
from app.core.tenancy import TenantDep
from app.history.schemas import Format
from app.sessions.router import SessionIdPath, checked_id

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["budget"])


@router.post("/usage", responses=problems(404, 413, 422))
async def report_usage(
    session_id: SessionIdPath,
    body: Annotated[UsageReport, Body(openapi_examples=USAGE_EXAMPLES)],
    engine: EngineDep,
    tenant: TenantDep,
    format: Annotated[Format | None, Query(description=FORMAT_FIELD_DESCRIPTION)] = None,
) -> UsageResponse:
    """Report the provider's usage for the last model call, right after it,
    before or after appending its reply: the report is about the context that
    call sent (``context_version``, else the last one GET /context served).
    Calibrates the estimate, gives the new verdict, and prunes when the verdict
    asks for it (``prune.auto``).

    The body is the native figures, or the provider's usage object or whole
    response exactly as its SDK returns it (``resp.usage.model_dump()``,
    ``resp.model_dump()``: OpenAI chat completions and Responses, Anthropic
    Messages, Gemini); see ``UsageReport``."""
    return await BudgetService(engine, tenant).usage(
        checked_id(session_id), body, query_format=format
    )


@router.post("/prune", response_model=PruneResult, responses=problems(404, 413, 422))
async def prune(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    body: PruneRequest | None = None,
) -> Response:
    """Hide old tool outputs from the model (they stay stored), or with
    ``dry_run`` say which would be hidden. Optional thresholds override the
    session's ``prune`` config for this call."""
    result = await BudgetService(engine, tenant).prune(
        checked_id(session_id), body or PruneRequest()
    )
    # Serialized once, by pydantic's own encoder: a first prune can list thousands
    # of outputs, and the response model pass would validate them all again.
    return Response(result.model_dump_json(), media_type="application/json")


@router.post("/overflow-errors", responses=problems(404, 413, 422))
async def report_provider_error(
    session_id: SessionIdPath, body: ProviderError, engine: EngineDep, tenant: TenantDep
) -> ProviderErrorVerdict:
    """Forward a provider's error: says whether it is a context-window overflow
    and, if so, relieves the window at once (pruning, with no minimum)."""
    return await BudgetService(engine, tenant).provider_error(checked_id(session_id), body)
