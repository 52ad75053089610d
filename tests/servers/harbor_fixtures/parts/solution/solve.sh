touch /app/a.txt /app/b.txt
