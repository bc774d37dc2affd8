// Logging: a thin layer over spdlog. Every l2l process calls InitLogging() once in main()
// and then logs with L2L_LOG_{DEBUG,INFO,WARN,ERROR}("format {}", args) (fmt syntax).
// Lines go to stderr (and, optionally, appended to a file) as
//   2024-05-20 12:34:56.789 I eps 1234] message
// i.e. time, level letter, process tag, pid. Before InitLogging() the macros still work
// and use spdlog's default stderr logger.
//
// Thread-safety: the macros may be called from any thread (spdlog's *_mt sinks);
// InitLogging() must not race with other InitLogging() calls.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace l2l {

// level: "trace", "debug", "info", "warn", "error", "off". file: empty for stderr only,
// else lines are also appended to it (created if missing). tag: the process name shown
// on each line ("eps", "worker-0", ...).
Status InitLogging(const std::string& level = "info", const std::string& file = "",
                   const std::string& tag = "l2l");

// Changes the level of the current logger (e.g. from a --verbose flag or an RPC).
Status SetLogLevel(const std::string& level);

// Flushes the sinks (call before exiting on an error).
void FlushLogs();

}  // namespace l2l

#define L2L_LOG_TRACE(...) ::spdlog::trace(__VA_ARGS__)
#define L2L_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define L2L_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define L2L_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define L2L_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
