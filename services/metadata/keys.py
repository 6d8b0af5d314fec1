"""The Redis key schema of every dhisparse service, in one place.

All keys live under a namespace prefix (default ``dhisparse``; tests use a unique one) so that one
Redis can hold several deployments. Build key names only through ``Keys``; never format them by
hand elsewhere. Each method documents the key's Redis type, its fields, and its single writer
(the owner); anyone may read.

    {ns}:req:{request_id}                   hash   owner: decoder   request state
    {ns}:reqs                               set    owner: decoder   ids of known requests
    {ns}:residency:{request_id}             hash   owner: decoder   per-request residency summary
    {ns}:decoder:{decoder_id}:heartbeat     hash   owner: decoder   liveness + load (with a TTL)
    {ns}:decoders                           set    owner: decoder   ids of decoders ever seen
    {ns}:kvtier:{instance}:info             hash   owner: kvtier    instance info (segment, layout)
    {ns}:kvtier:{instance}:reqs             set    owner: kvtier    request ids in the page table
    {ns}:kvtier:{instance}:pt:{request_id}  hash   owner: kvtier    page-table entry (scalars)
    {ns}:kvtier:{instance}:pt:{request_id}:pages  list  owner: kvtier  host page ids, logical order
    {ns}:kvtier:{instance}:leases           hash   owner: kvtier    decoder_id -> lease expiry (unix s)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def check_name(what: str, name: str) -> str:
    """Ids embedded in key names: 1-128 chars of ``[A-Za-z0-9_.-]`` (no ':' or spaces)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what} must be 1-128 characters of [A-Za-z0-9_.-], got {name!r}")
    return name


@dataclass(frozen=True)
class Keys:
    namespace: str = "dhisparse"

    def __post_init__(self) -> None:
        check_name("namespace", self.namespace)

    # --- requests (decoder) -------------------------------------------------------------------
    def request(self, request_id: str) -> str:
        """hash: ``state`` (waiting|running|finished|aborted), ``owner_decoder``,
        ``num_prompt_tokens``, ``num_output_tokens``, ``updated_unix_s``."""
        return f"{self.namespace}:req:{check_name('request_id', request_id)}"

    def requests(self) -> str:
        """set of request ids that have a ``request`` hash."""
        return f"{self.namespace}:reqs"

    def residency(self, request_id: str) -> str:
        """hash: ``mode`` (FULL|SPARSE), ``num_hot_pages``, ``num_host_pages``,
        ``num_committed_pages``, ``updated_unix_s``."""
        return f"{self.namespace}:residency:{check_name('request_id', request_id)}"

    # --- decoders (decoder) -------------------------------------------------------------------
    def decoder_heartbeat(self, decoder_id: str) -> str:
        """hash with a key TTL (expires when the decoder stops): ``num_free_slots``,
        ``num_running``, ``num_full``, ``num_sparse``, ``address``, ``updated_unix_s``; also
        ``decoder_id``, ``model``, ``num_waiting``, ``max_num_seqs``, ``max_num_waiting``,
        ``num_total_slots``, ``load``, ``saturated`` / ``draining`` (0|1), ``num_generated_tokens``
        (written by ``services/decoder/service/heartbeat.py``)."""
        return f"{self.namespace}:decoder:{check_name('decoder_id', decoder_id)}:heartbeat"

    def decoders(self) -> str:
        """set of decoder ids that have heartbeated at least once."""
        return f"{self.namespace}:decoders"

    # --- kvtier (kvtier) ----------------------------------------------------------------------
    def kvtier_prefix(self, instance: str) -> str:
        """Common prefix of every key of one kvtier instance (its clean shutdown deletes them)."""
        return f"{self.namespace}:kvtier:{check_name('instance', instance)}:"

    def kvtier_info(self, instance: str) -> str:
        """hash: ``segment_name``, ``num_host_pages``, ``layout`` (JSON), ``model_id`` (bound by
        config or the first attach), ``pid``, ``created_unix_s``."""
        return self.kvtier_prefix(instance) + "info"

    def kvtier_requests(self, instance: str) -> str:
        """set of request ids that have a page-table entry."""
        return self.kvtier_prefix(instance) + "reqs"

    def kvtier_page_table(self, instance: str, request_id: str) -> str:
        """hash: ``owner`` (decoder id), ``num_committed`` (pages), ``resumable`` ("0"|"1")."""
        return self.kvtier_prefix(instance) + f"pt:{check_name('request_id', request_id)}"

    def kvtier_page_list(self, instance: str, request_id: str) -> str:
        """list of host page ids (decimal strings) in logical page order; append-only until freed."""
        return self.kvtier_page_table(instance, request_id) + ":pages"

    def kvtier_leases(self, instance: str) -> str:
        """hash: decoder id -> lease expiry in unix seconds (float as string)."""
        return self.kvtier_prefix(instance) + "leases"
