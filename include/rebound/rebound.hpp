// Everything public in one include: the JobQueue and its parts, and the optional libraries this
// program links (rebound::http, rebound::sqlite, rebound::redis, rebound::torch each define
// REBOUND_HAS_<NAME> for their users).
#pragma once

#include "rebound/delivery/address_guard.hpp"
#include "rebound/delivery/attempt.hpp"
#include "rebound/delivery/backoff.hpp"
#include "rebound/delivery/callback_sender.hpp"
#include "rebound/delivery/callback_transport.hpp"
#include "rebound/delivery/origin_gate.hpp"
#include "rebound/delivery/webhook_signature.hpp"
#include "rebound/errc.hpp"
#include "rebound/error.hpp"
#include "rebound/job.hpp"
#include "rebound/job_queue.hpp"
#include "rebound/job_queue_options.hpp"
#include "rebound/job_queue_status.hpp"
#include "rebound/log.hpp"
#include "rebound/make_model.hpp"
#include "rebound/metrics.hpp"
#include "rebound/model.hpp"
#include "rebound/model_repository.hpp"
#include "rebound/observer.hpp"
#include "rebound/served_models.hpp"
#include "rebound/store/job_store.hpp"
#include "rebound/store/make_store.hpp"
#include "rebound/store/memory_job_store.hpp"
#include "rebound/tenant.hpp"
#include "rebound/version.hpp"
#if defined(REBOUND_HAS_HTTP)
#include "rebound/delivery/curl_transport.hpp"
#include "rebound/http/otlp_tracer.hpp"
#include "rebound/http/server.hpp"
#endif
#if defined(REBOUND_HAS_SQLITE)
#include "rebound/store/sqlite_job_store.hpp"
#endif
#if defined(REBOUND_HAS_REDIS)
#include "rebound/store/redis_job_store.hpp"
#endif
#if defined(REBOUND_HAS_TORCH)
#include "rebound/torch/torchscript_model.hpp"
#endif
