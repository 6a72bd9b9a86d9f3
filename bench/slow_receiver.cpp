// Callback receivers as they are in the world, for bench/run.py: each answers 200 after a delay
// (200 ms by default) on kept-alive connections; a hung one accepts and never answers. One Asio
// thread holds thousands of connections, so the receiver is never what limits the sender.
//
//   slow_receiver --ports 9201,9202 [--hung-port 9209] [--delay-ms 200] --admin-port 9200
//
// GET on the admin port answers "<answered> <hung requests>": callbacks answered 200 so far, and
// requests the hung port has taken.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <boost/asio.hpp>

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

std::atomic<unsigned long long> answered{0};
std::atomic<unsigned long long> hung_requests{0};

enum class Mode { delayed, hung, admin };

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, Mode mode, std::chrono::milliseconds delay)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), mode_(mode), delay_(delay) {}

  void start() { read_head(); }

 private:
  void read_head() {
    asio::async_read_until(
        socket_, buffer_, "\r\n\r\n",
        [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
          if (!ec) self->on_head(n);
        });
  }

  void on_head(std::size_t head_size) {
    std::string head(asio::buffers_begin(buffer_.data()),
                     asio::buffers_begin(buffer_.data()) + static_cast<long>(head_size));
    buffer_.consume(head_size);
    std::size_t length = 0;
    for (auto& c : head)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const auto at = head.find("content-length:");
    if (at != std::string::npos) length = std::strtoul(head.c_str() + at + 15, nullptr, 10);
    const std::size_t have = std::min(length, buffer_.size());
    buffer_.consume(have);
    skip_body(length - have);
  }

  void skip_body(std::size_t left) {
    if (left == 0) return on_request();
    asio::async_read(
        socket_, buffer_, asio::transfer_exactly(left),
        [self = shared_from_this(), left](boost::system::error_code ec, std::size_t n) {
          if (ec) return;
          self->buffer_.consume(n);
          self->skip_body(left - n);
        });
  }

  void on_request() {
    if (mode_ == Mode::hung) {
      ++hung_requests;
      // Never answered: keep the connection open until the peer gives up.
      asio::async_read(socket_, buffer_, asio::transfer_at_least(1),
                       [self = shared_from_this()](boost::system::error_code, std::size_t) {});
      return;
    }
    if (mode_ == Mode::admin) {
      std::ostringstream body;
      body << answered.load() << " " << hung_requests.load() << "\n";
      return respond(body.str());
    }
    timer_.expires_after(delay_);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec) return;
      ++answered;
      self->respond({});
    });
  }

  void respond(const std::string& body) {
    response_ =
        "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                        if (!ec) self->read_head();
                      });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf buffer_;
  std::string response_;
  Mode mode_;
  std::chrono::milliseconds delay_;
};

void accept(tcp::acceptor& acceptor, Mode mode, std::chrono::milliseconds delay) {
  acceptor.async_accept([&acceptor, mode, delay](boost::system::error_code ec, tcp::socket socket) {
    if (!ec) {
      socket.set_option(tcp::no_delay(true));
      std::make_shared<Connection>(std::move(socket), mode, delay)->start();
    }
    accept(acceptor, mode, delay);
  });
}

std::vector<unsigned short> parse_ports(const std::string& list) {
  std::vector<unsigned short> ports;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) ports.push_back(static_cast<unsigned short>(std::stoi(item)));
  return ports;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<unsigned short> ports;
  unsigned short hung = 0, admin = 0;
  std::chrono::milliseconds delay{200};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--ports")
      ports = parse_ports(value);
    else if (flag == "--hung-port")
      hung = static_cast<unsigned short>(std::stoi(value));
    else if (flag == "--admin-port")
      admin = static_cast<unsigned short>(std::stoi(value));
    else if (flag == "--delay-ms")
      delay = std::chrono::milliseconds(std::stoi(value));
    else {
      std::cerr << "slow_receiver: unknown option " << flag << "\n";
      return 2;
    }
  }
  if (ports.empty() || admin == 0) {
    std::cerr
        << "usage: slow_receiver --ports P[,P...] --admin-port P [--hung-port P] [--delay-ms MS]\n";
    return 2;
  }
  asio::io_context io(1);
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;
  auto listen = [&](unsigned short port, Mode mode) {
    auto a = std::make_unique<tcp::acceptor>(io);
    tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), port);
    a->open(endpoint.protocol());
    a->set_option(tcp::acceptor::reuse_address(true));
    a->bind(endpoint);
    a->listen(4096);
    accept(*a, mode, delay);
    acceptors.push_back(std::move(a));
  };
  for (auto p : ports)
    listen(p, Mode::delayed);
  if (hung) listen(hung, Mode::hung);
  listen(admin, Mode::admin);
  asio::signal_set stop(io, SIGINT, SIGTERM);
  stop.async_wait([&](boost::system::error_code, int) { io.stop(); });
  io.run();
}
