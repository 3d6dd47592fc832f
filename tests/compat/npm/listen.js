// Joyent's changefeed npm Listener (1.5), run against a publisher by tests/compat/test_npm.py.
//
//   NODE_PATH=<dir>/node_modules node listen.js '<options as JSON>'
//
// The options are those of changefeed.createListener() less `log`: url, instance, service, and
// either changeKind (one resource: the package registers with v1) or resources (several: v2),
// plus backoff. Every event is printed to standard output as one JSON line:
//   {"event": "bootstrap", "data": <the registration reply's entry>}
//   {"event": "change", "data": <change item>}
//   {"event": "error", "message": "..."}       (the package keeps running after one)
//   {"event": "connection-end"}                (the socket closed; it re-registers)
// The package's own (bunyan) log goes to standard error. The process ends when its standard
// input closes.
'use strict';

var bunyan = require('bunyan');
var changefeed = require('changefeed');

function emit(line) {
    process.stdout.write(JSON.stringify(line) + '\n');
}

var options = JSON.parse(process.argv[2]);
options.log = bunyan.createLogger({name: 'npm-listener', level: 'info', stream: process.stderr});

var listener = changefeed.createListener(options);
listener.on('bootstrap', function (entry) {
    emit({event: 'bootstrap', data: entry});
});
listener.on('readable', function () {
    var item;
    while ((item = listener.read()) !== null) {
        emit({event: 'change', data: item});
    }
});
listener.on('error', function (err) {
    emit({event: 'error', message: String(err && err.message || err)});
});
listener.on('connection-end', function () {
    emit({event: 'connection-end'});
});

process.stdin.resume();
process.stdin.on('end', function () {
    listener.close();
    process.exit(0);
});

listener.register();
