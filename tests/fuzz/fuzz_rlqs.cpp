// libFuzzer target: Envoy's rate limit quota reports (proto/envoy/rlqs.proto) from any bytes,
// as the RLQS door takes them. Each input is a stream: chunks, each a length byte and that many
// bytes parsed as a `RateLimitQuotaUsageReports`, a second apart. Each message that parses goes
// through the mapping (src/grpc/rlqs_mapping.cpp) into one stream's session, which asks an
// engine; its assignments map back to messages. Properties: nothing crashes; a refused report
// names a field of the message and changes nothing (the session's buckets and domain); every
// answer serializes and parses back; a bucket's assignment (its rate and its burst) is never above
// its lease, for a whole second or more; two distinct buckets never share a resource id; a
// budget bucket's block (domain `b`) is what was
// drawn, only when admitted, and never outlives its window; the engine's invariants hold after
// every step (fuzz_support.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include <doorman/protocol/rlqs_session.hpp>

#include "fuzz_support.hpp"
#include "rlqs.pb.h"
#include "rlqs_mapping.hpp"

using namespace doorman_fuzz;

namespace {

namespace pb = ::envoy::service::rate_limit_quota::v3;

// The shared templates, and buckets of domain `b` (`b/key=value`) as a budget of 500 a minute.
std::string rlqs_config() {
  std::string text = config_text();
  const std::string budget = R"(
    {"identifier_glob": "b/*", "capacity": 500, "budget": {"window": "minute"},
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 10, "refresh_interval": 2}},)";
  text.insert(text.find('[') + 1, budget);
  return text;
}

engine_type& engine() {
  static engine_type eng(engine_type::parse_config(rlqs_config()));
  static const bool master = (eng.set_mastership(true, "fuzz:1", clock_type::time_point{}), true);
  (void)master;
  return eng;
}

// A session's draw, answered by the engine: a block only for an admitted draw, of what it drew,
// within its window; every action serializes.
void draw_blocks(doorman::rlqs::session& s, engine_type& eng, const doorman::count_request& draw,
                 clock_type::time_point now, double t) {
  for (const auto& x : draw.resources)
    DOORMAN_FUZZ_CHECK(x.hits >= 1 && x.hits <= doorman::request_limits::max_hits, x.resource_id);
  const auto v = eng.count_hits(draw, now);
  DOORMAN_FUZZ_CHECK(v.has_value(), v.error().message);
  const auto actions = s.drawn(v.value(), t);
  DOORMAN_FUZZ_CHECK(actions.has_value(), "master");
  pb::RateLimitQuotaResponse out;
  for (const auto& act : actions.value()) {
    const auto rid = doorman::rlqs::session::resource_of(s.domain(), act.bucket);
    const doorman::hit_verdict* verdict = nullptr;
    for (const auto& x : v.value().resources)
      if (x.resource_id == rid) verdict = &x;
    DOORMAN_FUZZ_CHECK(verdict != nullptr, rid);
    DOORMAN_FUZZ_CHECK(act.ttl >= 1 && static_cast<double>(act.ttl) <= verdict->reset, rid);
    if (act.spend) {
      DOORMAN_FUZZ_CHECK(verdict->admitted, rid);
      for (const auto& x : draw.resources)
        if (x.resource_id == rid) DOORMAN_FUZZ_CHECK(act.spend->tokens == x.hits, rid);
    } else {
      DOORMAN_FUZZ_CHECK(act.assign && act.assign->per_minute == 0 && !verdict->admitted, rid);
    }
    doorman::grpc_door::to_proto(act, *out.add_bucket_action());
  }
  std::string bytes;
  DOORMAN_FUZZ_CHECK(out.SerializeToString(&bytes), "serialize");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::uint64_t streams = 0;
  auto& eng = engine();
  static clock_type::time_point now = clock_type::time_point{} + std::chrono::seconds(100);
  doorman::rlqs::session s("rlqs/fuzz/" + std::to_string(++streams), {.max_buckets = 50});
  std::map<std::string, doorman::rlqs::bucket_id> bucket_of;  // each resource id's bucket
  std::size_t at = 0;
  while (at < size) {
    const std::size_t n = std::min<std::size_t>(data[at], size - at - 1);
    pb::RateLimitQuotaUsageReports in;
    const bool parsed = in.ParseFromArray(data + at + 1, static_cast<int>(n));
    at += 1 + n;
    now += std::chrono::seconds(1);
    const double t = doorman::to_seconds(now.time_since_epoch());
    if (parsed) {
      const std::size_t buckets = s.buckets();
      const std::string domain = s.domain();
      const auto reports = doorman::grpc_door::from_proto(in);
      const auto r = s.report(reports, t);
      // Distinct buckets never share a resource (their keys and values are escaped).
      for (const auto& u : r ? reports.usages : decltype(reports.usages){}) {
        auto id = u.bucket;
        std::sort(id.begin(), id.end());
        const auto rid = doorman::rlqs::session::resource_of(s.domain(), id);
        const auto [known, fresh] = bucket_of.try_emplace(rid, id);
        DOORMAN_FUZZ_CHECK(fresh || known->second == id, rid);
      }
      if (!r) {
        const auto& m = r.error().message;
        DOORMAN_FUZZ_CHECK(m.starts_with("domain: ") || m.starts_with("bucket_quota_usages"), m);
        DOORMAN_FUZZ_CHECK(s.buckets() == buckets && s.domain() == domain, m);
      }
    }
    auto [abandoned, ids] = s.expire(t);
    if (!ids.empty()) (void)eng.release_capacity({s.client_id(), ids}, now);
    if (auto ask = s.ask(t)) {
      const auto a = eng.get_capacity(*ask, now);
      DOORMAN_FUZZ_CHECK(a.has_value(), a.error().message);
      const auto actions = s.answer(a.value(), t);
      DOORMAN_FUZZ_CHECK(actions.has_value(), "master");
      pb::RateLimitQuotaResponse out;
      for (const auto& act : actions.value()) {
        DOORMAN_FUZZ_CHECK(act.assign.has_value(), "an answer assigns");
        const auto rid = doorman::rlqs::session::resource_of(s.domain(), act.bucket);
        double granted = -1;
        for (const auto& g : a.value().resources)
          if (g.resource_id == rid) granted = g.gets.capacity;
        DOORMAN_FUZZ_CHECK(act.assign->rate() <= granted + 1e-9, rid);
        DOORMAN_FUZZ_CHECK(act.assign->burst <= std::max(1.0, granted), rid);
        DOORMAN_FUZZ_CHECK(act.ttl >= 1, rid);
        doorman::grpc_door::to_proto(act, *out.add_bucket_action());
      }
      std::string bytes;
      DOORMAN_FUZZ_CHECK(out.SerializeToString(&bytes), "serialize");
      pb::RateLimitQuotaResponse back;
      DOORMAN_FUZZ_CHECK(back.ParseFromString(bytes), "parse back");
    }
    if (auto draw = s.draw(t)) draw_blocks(s, eng, *draw, now, t);
    check_engine(eng, now, now);
  }
  (void)eng.release_capacity(s.release_all(), now);
  return 0;
}
