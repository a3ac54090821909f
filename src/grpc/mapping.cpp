// Doorman's gRPC messages to doorman's requests and back (see mapping.hpp).

#include "mapping.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <string_view>
#include <utility>

namespace doorman::grpc_door {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

lease_info from_proto(const ::doorman::Lease& l, double now_unix) {
  return {l.capacity(), static_cast<double>(l.expiry_time()) - now_unix,
          static_cast<double>(l.refresh_interval())};
}

void to_proto(const lease_info& l, double now_unix, ::doorman::Lease& out) {
  // Whole seconds on Doorman's wire: the expiry rounds down (never past the real lease), and
  // the refresh interval, counted by the client from when the answer came, never ends after
  // that expiry: 0 when less than a second is left (ask again at once).
  const double expiry = std::floor(now_unix + std::max(0.0, l.expires_in));
  const double left = std::floor(std::max(0.0, expiry - now_unix));
  const double refresh = std::min(std::max(1.0, std::floor(l.refresh_interval)), left);
  out.set_expiry_time(static_cast<std::int64_t>(expiry));
  out.set_refresh_interval(static_cast<std::int64_t>(refresh));
  out.set_capacity(l.capacity);
}

namespace {

// The requests' resources, each read by `one` (with its `has` lease already in doorman's terms).
template <class Out, class In, class One>
std::vector<Out> resources_of(const In& list, double now_unix, One one) {
  std::vector<Out> out;
  out.reserve(static_cast<std::size_t>(list.size()));
  for (const auto& x : list) {
    Out q;
    q.resource_id = x.resource_id();
    if (x.has_has()) q.has = from_proto(x.has(), now_unix);
    one(x, q);
    out.push_back(std::move(q));
  }
  return out;
}

}  // namespace

// Doorman's protocol has no budget report: a budget gets 0 (reports_spend false).
capacity_request from_proto(const ::doorman::GetCapacityRequest& r, double now_unix) {
  return {r.client_id(),
          resources_of<resource_request>(r.resource(), now_unix,
                                         [](const auto& x, resource_request& q) {
                                           q.priority = x.priority();
                                           q.wants = x.wants();
                                         }),
          false};
}

server_capacity_request from_proto(const ::doorman::GetServerCapacityRequest& r, double now_unix) {
  return {r.server_id(),
          resources_of<server_resource_request>(
              r.resource(), now_unix,
              [](const auto& x, server_resource_request& q) {
                q.outstanding = 0;  // not on Doorman's wire
                for (const auto& b : x.wants())
                  q.wants.push_back({b.priority(), b.num_clients(), b.wants()});
              }),
          false};
}

release_request from_proto(const ::doorman::ReleaseCapacityRequest& r,
                           std::vector<std::size_t>* kept) {
  release_request out{r.client_id(), {}};
  for (int i = 0; i < r.resource_id_size(); ++i) {
    if (r.resource_id(i).empty()) continue;  // Doorman's client pads with empty ids
    out.resources.push_back(r.resource_id(i));
    if (kept) kept->push_back(static_cast<std::size_t>(i));
  }
  return out;
}

namespace {

void mastership_to_proto(const mastership_info& m, ::doorman::Mastership& out) {
  if (m.master) out.set_master_address(*m.master);
}

// An answer's mastership and grants, each grant finished by `more`.
template <class Answer, class Out, class More>
void grants_to_proto(const Answer& a, double now_unix, Out& out, More more) {
  if (!a.mastership.is_master) mastership_to_proto(a.mastership, *out.mutable_mastership());
  for (const auto& g : a.resources) {
    auto& x = *out.add_response();
    x.set_resource_id(g.resource_id);
    to_proto(g.gets, now_unix, *x.mutable_gets());
    x.set_safe_capacity(g.safe_capacity);
    more(g, x);
  }
}

}  // namespace

void to_proto(const capacity_response& a, double now_unix, ::doorman::GetCapacityResponse& out) {
  grants_to_proto(a, now_unix, out, [](const auto&, auto&) {});
}

void to_proto(const server_capacity_response& a, double now_unix,
              ::doorman::GetServerCapacityResponse& out) {
  grants_to_proto(
      a, now_unix, out,
      [](const server_resource_grant& g, ::doorman::ServerCapacityResourceResponse& x) {
        auto& alg = *x.mutable_algorithm();
        ::doorman::Algorithm::Kind kind = ::doorman::Algorithm::NO_ALGORITHM;
        (void)::doorman::Algorithm::Kind_Parse(g.algorithm.kind, &kind);  // else NO_ALGORITHM
        alg.set_kind(kind);
        alg.set_lease_length(
            static_cast<std::int64_t>(std::floor(g.algorithm.lease_length.count())));
        alg.set_refresh_interval(
            static_cast<std::int64_t>(std::floor(g.algorithm.refresh_interval.count())));
        alg.set_learning_mode_duration(
            static_cast<std::int64_t>(std::floor(g.algorithm.learning_mode_duration.count())));
        for (const auto& [name, value] : g.algorithm.parameters.items()) {
          auto& p = *alg.add_parameters();
          p.set_name(name);
          p.set_value(value.is_string() ? value.get<std::string>() : value.dump());
        }
      });
}

void to_proto(const release_response& a, ::doorman::ReleaseCapacityResponse& out) {
  if (!a.mastership.is_master) mastership_to_proto(a.mastership, *out.mutable_mastership());
}

void to_proto(const discovery_response& a, ::doorman::DiscoveryResponse& out) {
  mastership_to_proto(a.mastership, *out.mutable_mastership());
  out.set_is_master(a.mastership.is_master);
}

void to_proto(const server_capacity_request& r, double now_unix,
              ::doorman::GetServerCapacityRequest& out) {
  out.set_server_id(r.server_id);
  for (const auto& q : r.resources) {
    auto& x = *out.add_resource();
    x.set_resource_id(q.resource_id);
    if (q.has) to_proto(*q.has, now_unix, *x.mutable_has());
    for (const auto& b : q.wants) {
      auto& w = *x.add_wants();
      w.set_priority(b.priority);
      w.set_num_clients(b.num_clients);
      w.set_wants(b.wants);
    }
  }
}

server_capacity_response from_proto(const ::doorman::GetServerCapacityResponse& r,
                                    double now_unix) {
  server_capacity_response out;
  out.mastership.is_master = !r.has_mastership();
  if (r.has_mastership() && !r.mastership().master_address().empty())
    out.mastership.master = r.mastership().master_address();
  for (const auto& x : r.response()) {
    server_resource_grant g;
    g.resource_id = x.resource_id();
    g.gets = from_proto(x.gets(), now_unix);
    g.safe_capacity = x.safe_capacity();
    const auto& alg = x.algorithm();
    g.algorithm.kind = ::doorman::Algorithm::Kind_Name(alg.kind());
    g.algorithm.lease_length = seconds(static_cast<double>(alg.lease_length()));
    g.algorithm.refresh_interval = seconds(static_cast<double>(alg.refresh_interval()));
    g.algorithm.learning_mode_duration = seconds(static_cast<double>(
        alg.has_learning_mode_duration() ? alg.learning_mode_duration() : alg.lease_length()));
    for (const auto& p : alg.parameters()) {
      auto v = nlohmann::json::parse(p.value(), nullptr, false);
      g.algorithm.parameters[p.name()] = v.is_number() ? v : nlohmann::json(p.value());
    }
    out.resources.push_back(std::move(g));
  }
  return out;
}

std::string proto_path(std::string message, std::string_view list,
                       const std::vector<std::size_t>& indices) {
  if (const auto at = message.find("resources["); at != std::string::npos && !indices.empty()) {
    const auto from = at + std::string_view("resources[").size();
    const auto end = message.find(']', from);
    std::size_t i = 0;
    const auto [p, ec] = std::from_chars(message.data() + from, message.data() + end, i);
    if (end != std::string::npos && ec == std::errc() && p == message.data() + end &&
        i < indices.size()) {
      message.replace(from, end - from, std::to_string(indices[i]));
    }
  }
  const std::pair<std::string_view, std::string> renames[] = {
      {"params.", ""}, {"resources[", std::string(list) + "["}, {".expires_in", ".expiry_time"}};
  for (const auto& [from, to] : renames) {
    if (const auto at = message.find(from); at != std::string::npos)
      message.replace(at, from.size(), to);
  }
  return message;
}

}  // namespace doorman::grpc_door
