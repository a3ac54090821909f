#pragma once

/// \file
/// The definitions that `DOORMAN_SEPARATE_COMPILATION` takes out of the headers
/// (<doorman/core/linkage.hpp>): include this in exactly one translation unit of a program
/// built with that macro defined, as asio's <asio/impl/src.hpp>. The CMake target
/// `doorman::compiled` is that unit.

#if !defined(DOORMAN_SEPARATE_COMPILATION)
#error \
    "<doorman/src.hpp> is for DOORMAN_SEPARATE_COMPILATION builds; header-only builds need no source"
#endif

// The lambdas that the functions below hand to templates have no linkage; GCC warns about that
// in a header, for fear of two definitions. These are defined once, here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
#endif

#include "doorman/client/impl/client.ipp"
#include "doorman/client/impl/resource.ipp"
#include "doorman/net/impl/channel.ipp"
#include "doorman/net/impl/etcd.ipp"
#include "doorman/net/impl/http.ipp"
#include "doorman/net/impl/http_server.ipp"
#include "doorman/net/impl/listener.ipp"
#include "doorman/net/impl/server.ipp"
#include "doorman/net/impl/supervise.ipp"
#include "doorman/net/impl/tls.ipp"
#include "doorman/node/impl/config_source.ipp"
#include "doorman/node/impl/etcd_election.ipp"
