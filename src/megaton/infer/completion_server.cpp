#include "megaton/infer/completion_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "megaton/core/error.h"
#include "megaton/infer/chat_template.h"
#include "megaton/infer/openai_response.h"
#include "megaton/infer/sequence_queue.h"
#include "megaton/infer/server_metrics.h"

namespace megaton::infer {

struct CompletionServer::Impl {
  Impl(models::TransformerModel& model, const data::Tokenizer& tokenizer, ServerOptions options)
      : model(model), tokenizer(tokenizer), options(std::move(options)), queue(model, tokenizer, this->options.max_sequences, this->options.kv_cache_tokens,
            this->options.kv_cache_dtype) {}

  models::TransformerModel& model;
  const data::Tokenizer& tokenizer;
  ServerOptions options;
  SequenceQueue queue;
  ServerMetrics metrics;
  httplib::Server http;
  std::atomic<int64_t> next_id{0};

  void setup();
  void complete(const httplib::Request& req, httplib::Response& res, bool chat);
  std::shared_ptr<Sequence> sequence_for(const CompletionRequest& r);
  void stream(httplib::Response& res, std::shared_ptr<Sequence> seq, const ResponseHeader& header);
};

namespace {

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "") {
  res.status = status;
  res.set_content(dump(error_body(status, message, param)), "application/json");
}

}  // namespace

std::shared_ptr<Sequence> CompletionServer::Impl::sequence_for(const CompletionRequest& r) {
  auto seq = std::make_shared<Sequence>();
  seq->stop = r.stop;
  if (r.chat) {
    seq->prompt = tokenizer.encode(render_chat(r.messages));
    seq->stop.push_back(kChatTurnStop);
  } else {
    seq->prompt = r.prompt ? tokenizer.encode(*r.prompt) : r.prompt_ids;
  }
  const int64_t vocab = model.config().vocab_size;
  const int64_t context = model.config().max_position_embeddings;
  const int64_t max_prompt = options.max_prompt_tokens > 0 ? std::min(options.max_prompt_tokens, context - 1) : context - 1;
  const char* field = r.chat ? "messages" : "prompt";
  if (seq->prompt.empty()) throw RequestError(400, field, "the prompt encodes to no tokens");
  if (static_cast<int64_t>(seq->prompt.size()) > max_prompt)
    throw RequestError(400, field,
                       "the prompt has " + std::to_string(seq->prompt.size()) + " tokens; at most " +
                           std::to_string(max_prompt) + " are accepted (the model's context is " +
                           std::to_string(context) + " positions)");
  for (int32_t id : seq->prompt)
    if (id >= vocab)
      throw RequestError(400, field, "token id " + std::to_string(id) + " is out of range: the model's vocabulary has " +
                                         std::to_string(vocab) + " ids");
  SamplingOptions& s = seq->sampling;
  s.temperature = r.temperature;
  s.top_p = r.top_p;
  s.top_k = r.top_k;
  s.min_p = r.min_p;
  s.repetition_penalty = r.repetition_penalty;
  s.presence_penalty = r.presence_penalty;
  s.frequency_penalty = r.frequency_penalty;
  s.seed = r.seed ? *r.seed : static_cast<uint64_t>(next_id.load());
  s.max_new_tokens = r.max_tokens;
  s.stop_token = tokenizer.eod();
  s.vocab_size = tokenizer.vocab_size();
  s.logprobs = r.logprobs;
  return seq;
}

void CompletionServer::Impl::complete(const httplib::Request& req, httplib::Response& res, bool chat) {
  const nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return send_error(res, 400, "the request body is not valid JSON");
  std::shared_ptr<Sequence> seq;
  CompletionRequest r;
  try {
    r = parse_completion_request(body, chat, options.limits);
    seq = sequence_for(r);
  } catch (const RequestError& e) {
    return send_error(res, e.status, e.what(), e.param);
  }
  if (!queue.submit(seq))
    return send_error(res, 429, "too many sequences at once (" + std::to_string(options.max_sequences) +
                                    " wait or run); retry later");
  const ResponseHeader header{std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++),
                              static_cast<int64_t>(std::time(nullptr)), options.model_name, chat, r.logprobs};
  if (r.stream) return stream(res, seq, header);
  seq->wait_done();
  const auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - seq->queued_at).count();
  std::lock_guard lock(seq->mutex);
  if (!seq->error.empty()) return send_error(res, 500, "generation failed: " + seq->error);
  metrics.observe_sequence(static_cast<int64_t>(seq->prompt.size()), seq->completion_tokens, elapsed,
                           seq->first_token_s);
  res.set_content(
      dump(completion_body(header, seq->text, seq->finish_reason,
                           {static_cast<int64_t>(seq->prompt.size()), seq->completion_tokens}, seq->logprobs)),
      "application/json");
}

void CompletionServer::Impl::stream(httplib::Response& res, std::shared_ptr<Sequence> seq, const ResponseHeader& header) {
  struct Sent {
    bool first = true;
    int64_t token_bytes = 0;  // token text sent with logprobs so far: the next chunk's text_offset
  };
  auto sent = std::make_shared<Sent>();
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, seq, header, sent](size_t, httplib::DataSink& sink) {
        const auto event = [&](const nlohmann::json& j) {
          const std::string line = "data: " + dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        // A chunk carries the logprobs of every token recorded since the last one.
        const auto chunk = [&](const std::string& text, const std::string& finish_reason) {
          const std::vector<LoggedToken> tokens = seq->take_logprobs();
          const nlohmann::json j =
              completion_chunk(header, text, finish_reason, sent->first, tokens, sent->token_bytes);
          for (const LoggedToken& t : tokens) sent->token_bytes += static_cast<int64_t>(t.text.size());
          sent->first = false;
          return j;
        };
        for (const std::string& piece : seq->take_pieces())
          if (!event(chunk(piece, ""))) return false;  // the client is gone
        std::unique_lock lock(seq->mutex);
        if (!seq->done) return true;  // called again for the next pieces
        if (!seq->pieces.empty()) return true;
        const auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - seq->queued_at).count();
        if (!seq->error.empty()) {
          event(error_body(500, "generation failed: " + seq->error, ""));
        } else {
          metrics.observe_sequence(static_cast<int64_t>(seq->prompt.size()), seq->completion_tokens, elapsed,
                                   seq->first_token_s);
          const std::string reason = seq->finish_reason;
          lock.unlock();  // done: nothing changes the sequence any more, and take_logprobs locks it
          event(chunk("", reason));
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      },
      [seq](bool success) {
        if (!success) seq->cancelled = true;  // stops generating at its next token
      });
}

void CompletionServer::Impl::setup() {
  http.set_payload_max_length(static_cast<size_t>(options.max_request_bytes));
  // cpp-httplib gives a client 5 s from connecting to sending its request; on a loaded machine a
  // client's thread can be descheduled that long between the two (seen in CI: two of 16 concurrent
  // requests dropped unanswered), so allow 30 s.
  http.set_read_timeout(30, 0);
  // One HTTP thread per sequence that may wait or run (each streams from its own), and a few for the
  // cheap endpoints, so /health and /metrics answer while every sequence slot is busy.
  const int threads = options.max_sequences + 4;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "missing or wrong API key (send 'Authorization: Bearer <key>')");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, false); });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, true); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const nlohmann::json model = {{"id", options.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "megaton"}};
    res.set_content(dump({{"object", "list"}, {"data", nlohmann::json::array({model})}}), "application/json");
  });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus({queue.queued(), queue.running(), options.max_sequences, queue.kv_pages_used(),
                                        queue.kv_pages(), queue.preemptions()}),
                    "text/plain; version=0.0.4");
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error
    const std::string message = res.status == 404   ? "no endpoint " + req.method + " " + req.path
                                : res.status == 413 ? "the request body is too large"
                                                    : "the request was refused (HTTP " + std::to_string(res.status) + ")";
    send_error(res, res.status, message);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message += std::string(": ") + e.what();
    } catch (...) {
    }
    send_error(res, 500, message);
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.count_request(req.path, res.status);
  });
}

CompletionServer::CompletionServer(models::TransformerModel& model, const data::Tokenizer& tokenizer,
                                   ServerOptions options)
    : impl_(std::make_unique<Impl>(model, tokenizer, std::move(options))) {
  if (impl_->options.max_sequences < 1) fail("serve: --max-sequences must be at least 1");
  impl_->setup();
}

CompletionServer::~CompletionServer() { stop(); }

namespace {

// Debian's cpp-httplib (a compiled 0.11.4) listens with a backlog of 5. Sixteen clients connecting
// at once to a server on a loaded 2-core machine overflowed it (the kernel's ListenOverflows rose),
// and now and then one of them read a closed connection, its request never handled. Linux lets a
// listening socket's backlog be changed by calling listen() on it again; httplib keeps the socket
// to itself, so it is found among this process's descriptors by its port.
void widen_listen_backlog(int port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) continue;
    const in_port_t p = addr.ss_family == AF_INET6  ? reinterpret_cast<const sockaddr_in6&>(addr).sin6_port
                        : addr.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(addr).sin_port
                                                    : 0;
    if (ntohs(p) == port && listen(fd, SOMAXCONN) != 0)
      fail("serve: cannot widen the listen backlog of port ", port, ": ", std::strerror(errno));
  }
}

}  // namespace

int CompletionServer::bind() {
  const ServerOptions& o = impl_->options;
  const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host)
                               : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) fail("serve: cannot listen on ", o.host, ":", o.port, " (in use, or not an address of this machine)");
  widen_listen_backlog(port);
  return port;
}

void CompletionServer::serve() { impl_->http.listen_after_bind(); }

void CompletionServer::stop() { impl_->http.stop(); }

}  // namespace megaton::infer
